//! The one small client for the gateway's own requests of a member: the fleet view's (as the
//! user) and the shared-watch hub's (as the gateway itself). A request is built up with
//! [`Ask`] (a GET by default; `.accept(..)` to want one form of answer, `.post(..)` to send a
//! body), and sent with [`Ask::read`] (the whole body of a 2xx answer, up to
//! [`MAX_ANSWER_BYTES`]; the connection goes back to the pool) or [`Ask::open_watch`] (a watch:
//! no head timeout; the answer of a 200, its events to [`stream`]). The member's head is written as for an
//! ordinary request: the identity the request is made as, and the client's fields but
//! `Accept-Encoding` (the answer is read here), and but `Accept` when one form is wanted.
//!
//! What the request takes from the client's side is a [`ClientSide`]: the fleet view passes the
//! client's request, the hub a request of its own with no fields. [`ask`], [`ask_accepting`],
//! [`post`] and [`post_as`] are the short forms the fleet view's stations call.
//!
//! Never imports `fleet` or `watch`.

use std::time::Instant;

use bytes::Bytes;
use fleetgate_config_watcher::{ClusterRoute, Limits};
use serde_json::Value;

use crate::auth::Decided;
use crate::codec::http1::{BodyKind, Head};
use crate::errors::GatewayError;
use crate::exchange::member_head::{self, MemberRequest, Upgrade};
use crate::exchange::relay::{relay, ClientEvent, Pace, ResponseSink};
use crate::exchange::ShardExchange;
use crate::exchange::{self, Answer, Failure, NoBody, Outbound, RequestBody};
use crate::request::Peer;
use crate::runtime::Deadline;
use crate::upstream::UpstreamConn;

/// The largest answer read (a page of 500 large objects).
pub const MAX_ANSWER_BYTES: usize = 64 << 20;

/// What a member request takes from the request it is made for: the client's header fields
/// (passed on as in an ordinary request), which of them its `Connection` named, and who and
/// when. `'h`: the fields' lifetime.
pub(crate) trait ClientSide<'h> {
    fn fields(&self) -> impl Iterator<Item = (&'h [u8], &'h [u8])>;
    fn connection_named(&self, name: &[u8]) -> bool;
    fn peer(&self) -> Peer;
    fn limits(&self) -> Limits;
    fn started(&self) -> Instant;
}

/// Why a member's answer could not be had.
#[derive(Debug)]
pub(crate) enum Missed {
    /// The member answered with this code (its Status message, if any).
    Answered(u16, String),
    /// It could not be reached or its answer could not be read.
    Failed(String),
}

impl Missed {
    pub fn warning(&self, cluster: &str) -> String {
        match self {
            Missed::Answered(code, message) => {
                format!("cluster {cluster} answered {code}: {message}; its objects are missing")
            }
            Missed::Failed(reason) => {
                format!("cluster {cluster}: {reason}; its objects are missing")
            }
        }
    }
}

/// A request's kube path, its query (with its `?`), the metrics verb.
pub(crate) struct Asked<'a> {
    pub rest: &'a [u8],
    pub query: &'a [u8],
    pub verb: &'static str,
}

/// A request body the gateway sends whole: a review, as the gateway wrote it or as the client
/// sent it (JSON or protobuf, `content_type` saying which).
#[derive(Clone, Copy)]
pub(crate) struct Posted<'b, 'c> {
    pub body: &'b [u8],
    pub content_type: &'c [u8],
}

/// Where a request goes and on whose behalf: the member, the identity it is told about, the
/// client's side.
pub(crate) struct To<'a, C> {
    pub cluster: &'a ClusterRoute,
    pub identity: &'a Decided,
    pub client: &'a C,
}

impl<'a, C> To<'a, C> {
    pub fn new(cluster: &'a ClusterRoute, identity: &'a Decided, client: &'a C) -> Self {
        To {
            cluster,
            identity,
            client,
        }
    }
}

/// One request of a member, built up, then sent with [`Ask::read`] or [`Ask::open`].
pub(crate) struct Ask<'a, 'h> {
    asked: &'a Asked<'a>,
    accept: Option<&'static [u8]>,
    post: Option<Posted<'a, 'h>>,
    long_running: bool,
}

impl<'a, 'h> Ask<'a, 'h> {
    /// A GET of `asked`.
    pub fn get(asked: &'a Asked<'a>) -> Self {
        Ask {
            asked,
            accept: None,
            post: None,
            long_running: false,
        }
    }

    /// `accept` as the member's `Accept`, instead of the client's.
    pub fn accept(mut self, accept: &'static [u8]) -> Self {
        self.accept = Some(accept);
        self
    }

    /// A POST of `posted` instead of a GET.
    pub fn post(mut self, posted: Posted<'a, 'h>) -> Self {
        self.post = Some(posted);
        self
    }

    /// Sends the request; the whole body of a 2xx answer.
    pub async fn read<C: ClientSide<'h>>(
        &self,
        ctx: &ShardExchange,
        to: &To<'_, C>,
    ) -> Result<Vec<u8>, Missed> {
        let (mut answer, response) = self.open(ctx, to).await?;
        let mut body = Collect {
            buf: Vec::new(),
            cluster: to.cluster,
        };
        let pace = exchange::pace(false, &to.client.limits());
        let complete = relay(&mut answer, &mut body, pace).await.map_err(failed)?;
        exchange::finish(ctx, answer, complete);
        if !complete {
            return Err(Missed::Failed("its answer ended early".into()));
        }
        if !(200..300).contains(&response.code) {
            return Err(Missed::Answered(response.code, status_message(&body.buf)));
        }
        Ok(body.buf)
    }

    /// Sends the request as a watch (no head timeout); the answer of a 200, its events still to
    /// [`stream`]. Any other code is [`Missed::Answered`] (the connection is closed).
    pub async fn open_watch<C: ClientSide<'h>>(
        mut self,
        ctx: &ShardExchange,
        to: &To<'_, C>,
    ) -> Result<Answer, Missed> {
        self.long_running = true;
        let (answer, response) = self.open(ctx, to).await?;
        if response.code != 200 {
            return Err(Missed::Answered(response.code, String::new()));
        }
        Ok(answer)
    }

    /// Sends the request; the answer with its head read, its body still to relay.
    async fn open<C: ClientSide<'h>>(
        &self,
        ctx: &ShardExchange,
        to: &To<'_, C>,
    ) -> Result<(Answer, Head), Missed> {
        let (accept, post, client) = (self.accept, self.post, to.client);
        let mut head_bytes = Vec::with_capacity(1024);
        member_head::write(
            &mut head_bytes,
            to.cluster,
            &MemberRequest {
                method: if post.is_some() { b"POST" } else { b"GET" },
                http10: false,
                rest: self.asked.rest,
                query: self.asked.query,
                body: post.map_or(BodyKind::Empty, |p| BodyKind::Length(p.body.len() as u64)),
                peer: client.peer().ip_text(),
                identity: to.identity.identity.as_deref(),
                upgrade: Upgrade::None,
                service: None,
            },
            // The answer is parsed here: it must come uncompressed (and in the form asked for).
            || {
                client
                    .fields()
                    .filter(move |(name, _)| {
                        let replaced = (accept.is_some() && name.eq_ignore_ascii_case(b"accept"))
                            || (post.is_some()
                                && (name.eq_ignore_ascii_case(b"content-type")
                                    || name.eq_ignore_ascii_case(b"content-length")
                                    || name.eq_ignore_ascii_case(b"transfer-encoding")));
                        !replaced && !name.eq_ignore_ascii_case(b"accept-encoding")
                    })
                    .chain(accept.map(|value| (&b"Accept"[..], value)))
                    .chain(post.map(|p| (&b"Content-Type"[..], p.content_type)))
            },
            |name| client.connection_named(name),
        );
        let peer = client.peer();
        let outbound = Outbound {
            cluster: to.cluster,
            service: None,
            head: &head_bytes,
            replayable: post.is_none(),
            long_running: self.long_running,
            upgrade: false,
            head_method: false,
            limits: client.limits(),
            verb: self.asked.verb,
            started: client.started(),
            client: peer.ip(),
        };
        let mut response = Head::default();
        let mut deadline = Deadline::new();
        let answer = match post {
            None => exchange::send(ctx, &outbound, &mut NoBody, &mut response, &mut deadline).await,
            Some(posted) => {
                let mut body = Fixed(posted.body);
                exchange::send(ctx, &outbound, &mut body, &mut response, &mut deadline).await
            }
        }
        .map_err(failed)?;
        Ok((answer, response))
    }
}

/// Streams a watch [`Ask::open_watch`] opened into `body` until the member ends it (its
/// connection then goes back to the pool) or it breaks (`body` refusing a piece included).
pub(crate) async fn stream(
    ctx: &ShardExchange,
    mut answer: Answer,
    body: &mut impl ResponseSink,
) -> Result<(), Missed> {
    let complete = relay(&mut answer, body, Pace::LongRunning)
        .await
        .map_err(failed)?;
    exchange::finish(ctx, answer, complete);
    Ok(())
}

/// Asks `cluster` for `asked` as the user; the body of a 200 answer.
pub(crate) async fn ask<'h, C: ClientSide<'h>>(
    ctx: &ShardExchange,
    asked: &Asked<'_>,
    client: &C,
    cluster: &ClusterRoute,
    identity: &Decided,
) -> Result<Vec<u8>, Missed> {
    ask_accepting(ctx, asked, None, client, cluster, identity).await
}

/// [`ask`], with `accept` (when given) as the member's `Accept` instead of the client's.
pub(crate) async fn ask_accepting<'h, C: ClientSide<'h>>(
    ctx: &ShardExchange,
    asked: &Asked<'_>,
    accept: Option<&'static [u8]>,
    client: &C,
    cluster: &ClusterRoute,
    identity: &Decided,
) -> Result<Vec<u8>, Missed> {
    let to = To::new(cluster, identity, client);
    let ask = Ask::get(asked);
    match accept {
        Some(accept) => ask.accept(accept),
        None => ask,
    }
    .read(ctx, &to)
    .await
}

/// A POST of the JSON `body` to `cluster` as the user (a review the member is asked for); the
/// body of a 2xx answer.
pub(crate) async fn post<'h, C: ClientSide<'h>>(
    ctx: &ShardExchange,
    asked: &Asked<'_>,
    body: &[u8],
    client: &C,
    cluster: &ClusterRoute,
    identity: &Decided,
) -> Result<Vec<u8>, Missed> {
    let posted = Posted {
        body,
        content_type: b"application/json",
    };
    post_as(ctx, asked, posted, client, cluster, identity).await
}

/// A POST of `posted` to `cluster` as the user, its answer asked for as JSON (to be read here);
/// the body of a 2xx answer.
pub(crate) async fn post_as<'h, C: ClientSide<'h>>(
    ctx: &ShardExchange,
    asked: &Asked<'_>,
    posted: Posted<'_, 'h>,
    client: &C,
    cluster: &ClusterRoute,
    identity: &Decided,
) -> Result<Vec<u8>, Missed> {
    let to = To::new(cluster, identity, client);
    let ask = Ask::get(asked).accept(b"application/json").post(posted);
    ask.read(ctx, &to).await
}

/// The `message` of a Status body, or nothing.
pub(crate) fn status_message(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_default()
}

/// A failure of the exchange, as what the gateway missed.
pub(crate) fn failed(failure: Failure) -> Missed {
    match failure {
        Failure::Answer(error) => Missed::Failed(error.to_string()),
        Failure::Abort(reason) => Missed::Failed(reason.to_string()),
    }
}

/// A small request body the gateway wrote itself, sent whole.
struct Fixed<'b>(&'b [u8]);

impl RequestBody for Fixed<'_> {
    async fn send(
        &mut self,
        conn: &mut UpstreamConn,
        cluster: &ClusterRoute,
    ) -> Result<(), Failure> {
        use tokio::io::AsyncWriteExt as _;
        conn.io.write_all(self.0).await.map_err(|e| {
            Failure::Answer(GatewayError::UpstreamClosed {
                cluster: cluster.name.to_string(),
                source: Some(e),
            })
        })
    }

    async fn client_gone(&mut self) {
        std::future::pending().await
    }
}

/// A member's body, gathered whole (up to [`MAX_ANSWER_BYTES`]).
struct Collect<'c> {
    buf: Vec<u8>,
    cluster: &'c ClusterRoute,
}

impl ResponseSink for Collect<'_> {
    fn decodes_chunks(&self) -> bool {
        true
    }

    async fn send(&mut self, piece: Bytes) -> Result<(), Failure> {
        if self.buf.len() + piece.len() > MAX_ANSWER_BYTES {
            return Err(Failure::Answer(GatewayError::UpstreamProtocol {
                cluster: self.cluster.name.to_string(),
                reason: "its answer is larger than the fleet view reads",
            }));
        }
        self.buf.extend_from_slice(&piece);
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), Failure> {
        Ok(())
    }

    async fn end(&mut self) -> Result<(), Failure> {
        Ok(())
    }

    async fn end_early(&mut self, _last_chunk: bool) -> Result<(), Failure> {
        Ok(())
    }

    async fn client_event(&mut self) -> ClientEvent {
        std::future::pending().await
    }
}
