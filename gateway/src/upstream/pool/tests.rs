//! The keep-alive pool in process: connections returned, handed out again, expired and found
//! dead. Each member connection is a stream of a real h2 connection (the tunnel's wire format)
//! over an in-memory pipe, its member end a task that answers every read with the member's
//! name: bytes in, bytes out, no socket, no sleep.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;
use crate::observe::metrics::Metrics;
use crate::runtime::tests::block_on;
use crate::tunnel::{wire, Counted, TunnelStream};
use crate::upstream::UpstreamIo;

/// Long enough that nothing expires during a test.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Routes of two pull-mode clusters, `edge` and `other`, from one table.
fn routes() -> (Arc<ClusterRoute>, Arc<ClusterRoute>) {
    let cluster = |name: &str| {
        format!(
            "apiVersion: fleetgate.io/v1alpha1\nkind: Cluster\nmetadata: {{name: {name}}}\n\
             spec: {{connectMode: Tunnel}}\n"
        )
    };
    let table =
        crate::testing::test_table(&format!("{}---\n{}", cluster("edge"), cluster("other")));
    let route = |name| table.cluster(name).unwrap().clone();
    (route("edge"), route("other"))
}

/// How the scripted member end of a connection behaves.
#[derive(Clone, Copy, PartialEq)]
enum Member {
    /// Answers every read with its name, until the gateway closes.
    Alive(&'static str),
    /// Closed the connection as soon as it opened (a member that closed an idle connection).
    Closed,
}

/// A connection to `cluster`'s member whose far end behaves as `member` says.
async fn conn(cluster: &ClusterRoute, member: Member) -> UpstreamConn {
    let (gateway_end, member_end) = tokio::io::duplex(64 * 1024);
    monoio::spawn(scripted_member(member_end, member));
    let (send, connection) = wire::gateway_h2(gateway_end).await.unwrap();
    monoio::spawn(async move { drop(connection.await) });
    let mut send = send.ready().await.unwrap();
    let (response, stream) = send.send_request(http::Request::new(()), false).unwrap();
    let body = response.await.unwrap().into_body();
    let io = Counted::new(TunnelStream::new(stream, body), Default::default());
    let metrics = Metrics::new().shard();
    UpstreamConn::for_test(UpstreamIo::Tunnel(Box::new(io)), cluster, &metrics)
}

async fn scripted_member(io: DuplexStream, member: Member) {
    let Ok(mut connection) = wire::agent_h2(io).await else {
        return;
    };
    while let Some(Ok((request, mut respond))) = connection.accept().await {
        let Member::Alive(name) = member else {
            let _ = respond.send_response(http::Response::new(()), true);
            continue;
        };
        let Ok(send) = respond.send_response(http::Response::new(()), false) else {
            continue;
        };
        monoio::spawn(async move {
            let mut stream = TunnelStream::new(send, request.into_body());
            let mut buf = [0u8; 1024];
            while let Ok(1..) = stream.read(&mut buf).await {
                if stream.write_all(name.as_bytes()).await.is_err() || stream.flush().await.is_err()
                {
                    return;
                }
            }
        });
    }
}

/// Which member answers a request written to `conn`.
async fn answered_by(conn: &mut UpstreamConn) -> String {
    conn.io.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    conn.io.flush().await.unwrap();
    let mut buf = [0u8; 64];
    let n = conn.io.read(&mut buf).await.unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn a_returned_connection_serves_the_next_request_to_its_cluster_only() {
    block_on(async {
        let (edge, other) = routes();
        let pool = ShardPool::new(4, IDLE_TIMEOUT);
        let key = PoolKey::new(&edge, None);
        assert!(pool.take(&key).is_none());
        let mut first = conn(&edge, Member::Alive("a")).await;
        assert!(!first.reused);
        assert_eq!(answered_by(&mut first).await, "a");
        pool.put(first);
        pool.put(conn(&edge, Member::Alive("b")).await);
        assert_eq!(pool.idle_count(), 2);
        // Another cluster never gets them.
        assert!(pool.take(&PoolKey::new(&other, None)).is_none());
        // The most recently returned first, each marked reused (a failure on it is retried).
        let mut latest = pool.take(&key).unwrap();
        assert!(latest.reused);
        assert_eq!(answered_by(&mut latest).await, "b");
        let mut older = pool.take(&key).unwrap();
        assert_eq!(answered_by(&mut older).await, "a");
        assert!(pool.take(&key).is_none());
        assert_eq!(pool.idle_count(), 0);
    })
}

#[test]
fn the_pool_keeps_at_most_its_limit_per_cluster_dropping_the_oldest() {
    block_on(async {
        let (edge, _) = routes();
        let pool = ShardPool::new(2, IDLE_TIMEOUT);
        for name in ["a", "b", "c"] {
            pool.put(conn(&edge, Member::Alive(name)).await);
        }
        assert_eq!(pool.idle_count(), 2);
        let key = PoolKey::new(&edge, None);
        let mut answers = Vec::new();
        while let Some(mut conn) = pool.take(&key) {
            answers.push(answered_by(&mut conn).await);
        }
        assert_eq!(answers, ["c", "b"]);
    })
}

#[test]
fn an_expired_connection_is_not_handed_out_again() {
    block_on(async {
        let (edge, _) = routes();
        // Every idle connection has expired by the time it is asked for.
        let pool = ShardPool::new(4, Duration::ZERO);
        pool.put(conn(&edge, Member::Alive("a")).await);
        assert!(pool.take(&PoolKey::new(&edge, None)).is_none());
        assert_eq!(pool.idle_count(), 0);
    })
}

#[test]
fn a_connection_the_member_closed_is_told_apart_from_a_live_one() {
    // What the pool probes (`UpstreamConn::closed_while_idle`) before it hands out a connection
    // idle for a while; the wait itself needs a clock this test does not move.
    block_on(async {
        let (edge, _) = routes();
        let mut live = conn(&edge, Member::Alive("a")).await;
        assert!(!live.closed_while_idle());
        assert_eq!(answered_by(&mut live).await, "a");
        let mut closed = conn(&edge, Member::Closed).await;
        assert!(closed.closed_while_idle());
    })
}
