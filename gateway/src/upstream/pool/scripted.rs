//! Scripted member connections for in-process tests (the pool's and the exchange's), in the
//! spirit of h2's mock I/O: an [`UpstreamConn`] as [`connect`](super::super::connect) gives one,
//! whose member end is a [`MemberEnd`] the test holds. What the gateway writes, the test reads;
//! what the test writes, the gateway reads from the member; the test ends it cleanly
//! (`shutdown`: END_STREAM, as a member's FIN) or drops it (a reset, as a member that died).
//!
//! Each connection is one stream of a real h2 connection (the tunnel's wire format, as a
//! pull-mode member's connection is) over an in-memory pipe, driven by two tasks of the test's
//! runtime: no socket, no timer. Reached as `upstream::scripted`; compiled for tests only.

use tokio::io::DuplexStream;
use tokio::sync::oneshot;

use fleetgate_config_watcher::ClusterRoute;

use crate::observe::metrics::Metrics;
use crate::tunnel::{wire, Counted, TunnelStream};
use crate::upstream::{UpstreamConn, UpstreamIo};

/// The member's end of a scripted connection: its stream, both ways.
pub(crate) type MemberEnd = TunnelStream;

/// A connection to `cluster`'s member, and the member's end of it.
pub(crate) async fn member_conn(cluster: &ClusterRoute) -> (UpstreamConn, MemberEnd) {
    let (conn, end) = open(cluster, false).await;
    (conn, end.expect("the member accepted the stream"))
}

/// A connection to `cluster`'s member that the member had closed by the time the gateway got it
/// (as a member closes an idle connection): its end of stream came with the member's answer.
pub(crate) async fn closed_member_conn(cluster: &ClusterRoute) -> UpstreamConn {
    open(cluster, true).await.0
}

async fn open(cluster: &ClusterRoute, closed: bool) -> (UpstreamConn, Option<MemberEnd>) {
    let (gateway_end, member_end) = tokio::io::duplex(64 * 1024);
    let (accepted, member) = oneshot::channel();
    monoio::spawn(member_connection(member_end, closed, accepted));
    let (send, connection) = wire::gateway_h2(gateway_end).await.unwrap();
    monoio::spawn(async move { drop(connection.await) });
    let mut send = send.ready().await.unwrap();
    let (response, stream) = send.send_request(http::Request::new(()), false).unwrap();
    let body = response.await.unwrap().into_body();
    let io = Counted::new(TunnelStream::new(stream, body), Default::default());
    let metrics = Metrics::new().shard();
    let conn = UpstreamConn::for_test(UpstreamIo::Tunnel(Box::new(io)), cluster, &metrics);
    (conn, member.await.unwrap())
}

/// The member's side of the h2 connection: accepts the gateway's stream (answering with its end
/// of stream at once when `closed`), hands it over, then carries the frames until the gateway
/// closes the connection.
async fn member_connection(
    io: DuplexStream,
    closed: bool,
    accepted: oneshot::Sender<Option<MemberEnd>>,
) {
    let Ok(mut connection) = wire::agent_h2(io).await else {
        return;
    };
    let Some(Ok((request, mut respond))) = connection.accept().await else {
        return;
    };
    let end = respond
        .send_response(http::Response::new(()), closed)
        .ok()
        .filter(|_| !closed)
        .map(|send| TunnelStream::new(send, request.into_body()));
    // Only the member's end holds the stream now: dropping it resets the stream.
    drop(respond);
    let _ = accepted.send(end);
    while let Some(Ok(_)) = connection.accept().await {}
}
