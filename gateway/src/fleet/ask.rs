//! One request the fleet view makes of a member, as the user: the member's head written as for
//! an ordinary request (the user's identity, the client's fields but `Accept-Encoding`, so the
//! answer can be read, and, when the view needs one form of answer, but `Accept`), sent through
//! the exchange, and the whole answer read (up to [`MAX_ANSWER_BYTES`]). The answer's
//! connection goes back to the pool.

use bytes::Bytes;
use fleetgate_config_watcher::ClusterRoute;
use serde_json::Value;

use super::ClientRequest;
use crate::auth::Decided;
use crate::errors::GatewayError;
use crate::exchange::member_head::{self, MemberRequest, Upgrade};
use crate::exchange::relay::{relay, ClientEvent, ResponseSink};
use crate::exchange::{self, Answer, Failure, NoBody, Outbound, RequestBody};
use crate::codec::http1::{BodyKind, Head};
use crate::runtime::{Deadline, ShardContext};
use crate::upstream::UpstreamConn;

/// The largest answer read (a page of 500 large objects).
pub const MAX_ANSWER_BYTES: usize = 64 << 20;

/// Why a member's answer could not be had.
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

/// A GET the fleet view makes: the kube path, its query (with its `?`), the metrics verb.
pub(crate) struct Asked<'a> {
    pub rest: &'a [u8],
    pub query: &'a [u8],
    pub verb: &'static str,
}

/// Asks `cluster` for `asked` as the user; the body of a 200 answer.
pub(crate) async fn ask<'h, F, H>(
    ctx: &ShardContext,
    asked: &Asked<'_>,
    client_request: &ClientRequest<'_, F>,
    cluster: &ClusterRoute,
    identity: &Decided,
) -> Result<Vec<u8>, Missed>
where
    F: Fn() -> H,
    H: Iterator<Item = (&'h [u8], &'h [u8])>,
{
    ask_accepting(ctx, asked, None, client_request, cluster, identity).await
}

/// [`ask`], with `accept` (when given) as the member's `Accept` instead of the client's.
pub(crate) async fn ask_accepting<'h, F, H>(
    ctx: &ShardContext,
    asked: &Asked<'_>,
    accept: Option<&'static [u8]>,
    client_request: &ClientRequest<'_, F>,
    cluster: &ClusterRoute,
    identity: &Decided,
) -> Result<Vec<u8>, Missed>
where
    F: Fn() -> H,
    H: Iterator<Item = (&'h [u8], &'h [u8])>,
{
    ask_with(ctx, asked, accept, None, client_request, cluster, identity).await
}

/// A POST of the JSON `body` to `cluster` as the user (a review the member is asked for); the
/// body of a 2xx answer.
pub(crate) async fn post<'h, F, H>(
    ctx: &ShardContext,
    asked: &Asked<'_>,
    body: &[u8],
    client_request: &ClientRequest<'_, F>,
    cluster: &ClusterRoute,
    identity: &Decided,
) -> Result<Vec<u8>, Missed>
where
    F: Fn() -> H,
    H: Iterator<Item = (&'h [u8], &'h [u8])>,
{
    let posted = Posted {
        body,
        content_type: b"application/json",
    };
    post_as(ctx, asked, posted, client_request, cluster, identity).await
}

/// A POST of `posted` to `cluster` as the user, its answer asked for as JSON (to be read here);
/// the body of a 2xx answer.
pub(crate) async fn post_as<'h, F, H>(
    ctx: &ShardContext,
    asked: &Asked<'_>,
    posted: Posted<'_, 'h>,
    client_request: &ClientRequest<'_, F>,
    cluster: &ClusterRoute,
    identity: &Decided,
) -> Result<Vec<u8>, Missed>
where
    F: Fn() -> H,
    H: Iterator<Item = (&'h [u8], &'h [u8])>,
{
    let accept = Some(&b"application/json"[..]);
    ask_with(
        ctx,
        asked,
        accept,
        Some(posted),
        client_request,
        cluster,
        identity,
    )
    .await
}

/// A request body the fleet view sends whole: a review, as the gateway wrote it or as the client
/// sent it (JSON or protobuf, `content_type` saying which).
#[derive(Clone, Copy)]
pub(crate) struct Posted<'b, 'c> {
    pub body: &'b [u8],
    pub content_type: &'c [u8],
}

/// [`open_accepting`], then the whole body of a 2xx answer.
async fn ask_with<'h, F, H>(
    ctx: &ShardContext,
    asked: &Asked<'_>,
    accept: Option<&'static [u8]>,
    post: Option<Posted<'_, 'h>>,
    client_request: &ClientRequest<'_, F>,
    cluster: &ClusterRoute,
    identity: &Decided,
) -> Result<Vec<u8>, Missed>
where
    F: Fn() -> H,
    H: Iterator<Item = (&'h [u8], &'h [u8])>,
{
    let (mut answer, response) = open_accepting(
        ctx,
        asked,
        accept,
        post,
        client_request,
        cluster,
        identity,
        false,
    )
    .await?;
    let mut body = Collect {
        buf: Vec::new(),
        cluster,
    };
    let pace = exchange::pace(false, &client_request.limits);
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

/// The `message` of a Status body, or nothing.
pub(crate) fn status_message(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_default()
}

/// A failure of the exchange, as what the fleet view missed.
pub(crate) fn failed(failure: Failure) -> Missed {
    match failure {
        Failure::Answer(error) => Missed::Failed(error.to_string()),
        Failure::Abort(reason) => Missed::Failed(reason.to_string()),
    }
}

/// Sends `asked` to `cluster` as the user (`long_running`: a watch, with no head timeout); the
/// answer with its head read, its body still to relay.
pub(crate) async fn open<'h, F, H>(
    ctx: &ShardContext,
    asked: &Asked<'_>,
    client_request: &ClientRequest<'_, F>,
    cluster: &ClusterRoute,
    identity: &Decided,
    long_running: bool,
) -> Result<(Answer, Head), Missed>
where
    F: Fn() -> H,
    H: Iterator<Item = (&'h [u8], &'h [u8])>,
{
    open_accepting(
        ctx,
        asked,
        None,
        None,
        client_request,
        cluster,
        identity,
        long_running,
    )
    .await
}

/// [`open`], with `accept` (when given) as the member's `Accept` instead of the client's, and
/// with `post` (when given) a POST of that body instead of a GET.
#[allow(clippy::too_many_arguments, reason = "the request's whole shape")]
pub(crate) async fn open_accepting<'h, F, H>(
    ctx: &ShardContext,
    asked: &Asked<'_>,
    accept: Option<&'static [u8]>,
    post: Option<Posted<'_, 'h>>,
    client_request: &ClientRequest<'_, F>,
    cluster: &ClusterRoute,
    identity: &Decided,
    long_running: bool,
) -> Result<(Answer, Head), Missed>
where
    F: Fn() -> H,
    H: Iterator<Item = (&'h [u8], &'h [u8])>,
{
    let mut head_bytes = Vec::with_capacity(1024);
    member_head::write(
        &mut head_bytes,
        cluster,
        &MemberRequest {
            method: if post.is_some() { b"POST" } else { b"GET" },
            http10: false,
            rest: asked.rest,
            query: asked.query,
            body: post.map_or(BodyKind::Empty, |p| BodyKind::Length(p.body.len() as u64)),
            peer: client_request.peer.ip_text(),
            identity: identity.identity.as_deref(),
            upgrade: Upgrade::None,
            service: None,
        },
        // The answer is parsed here: it must come uncompressed (and in the form asked for).
        || {
            (client_request.headers)()
                .filter(|(name, _)| {
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
        client_request.connection_named,
    );
    let outbound = Outbound {
        cluster,
        service: None,
        head: &head_bytes,
        replayable: post.is_none(),
        long_running,
        upgrade: false,
        head_method: false,
        limits: client_request.limits,
        verb: asked.verb,
        started: client_request.started,
        client: client_request.peer.ip(),
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
