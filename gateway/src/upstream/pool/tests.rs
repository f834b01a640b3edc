//! The keep-alive pool in process: connections returned, handed out again, expired, found
//! dead, and swept when their route retires. Each member connection is a scripted one
//! (`scripted`: a stream of a real h2 connection over an in-memory pipe), its member end a task
//! that answers every read with the member's name: bytes in, bytes out, no socket, no sleep.

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::scripted::{closed_member_conn, member_conn};
use super::*;
use crate::runtime::tests::block_on;

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
    let Member::Alive(name) = member else {
        return closed_member_conn(cluster).await;
    };
    let (conn, mut end) = member_conn(cluster).await;
    monoio::spawn(async move {
        let mut buf = [0u8; 1024];
        while let Ok(1..) = end.read(&mut buf).await {
            if end.write_all(name.as_bytes()).await.is_err() || end.flush().await.is_err() {
                return;
            }
        }
    });
    conn
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

/// Lets every task queued on this shard now run once: they run in order, so a task spawned now
/// runs after them.
async fn run_queued_tasks() {
    let (done, ran) = tokio::sync::oneshot::channel();
    monoio::spawn(async move {
        let _ = done.send(());
    });
    ran.await.unwrap();
}

#[test]
fn an_idle_shard_closes_the_connections_of_a_retired_route_by_itself() {
    block_on(async {
        let (edge, other) = routes();
        let pool = ShardPool::new(4, IDLE_TIMEOUT);
        pool.put(conn(&edge, Member::Alive("a")).await);
        pool.put(conn(&other, Member::Alive("b")).await);
        run_queued_tasks().await;
        // Retired on this shard's own thread, so the sweeper's wake-up is this runtime's own (no
        // other thread's timing), as the shard's own tasks see it.
        edge.retirement.retire();
        run_queued_tasks().await;
        // Nothing asked the pool for a connection since: its sweeper closed edge's by itself.
        assert_eq!(pool.idle_count(), 1);
        assert!(pool.take(&PoolKey::new(&edge, None)).is_none());
        let mut kept = pool.take(&PoolKey::new(&other, None)).unwrap();
        assert_eq!(answered_by(&mut kept).await, "b");
        // A connection of the retired route that comes back after its response is not kept.
        pool.put(conn(&edge, Member::Alive("c")).await);
        assert_eq!(pool.idle_count(), 0);
    })
}

/// A shard whose pool's sweeper waits for a retirement stops: its runtime ends, the pool dropped
/// with it, or kept by a task that never ended (a shard thread that died). A retirement on
/// another thread (the table publisher's) must still return. It deadlocked while retirements
/// were woken under the event's lock: the publisher, unable to deliver the dead shard's wake-up,
/// freed the sweeper task inside that locked notify, and the task's wait, unregistering, took the
/// same lock.
#[test]
fn a_retirement_after_a_shard_stopped_does_not_block_the_publisher() {
    for pool_outlives_its_shard in [false, true] {
        std::thread::spawn(move || {
            block_on(async move {
                let (edge, _) = routes();
                let pool = ShardPool::new(4, IDLE_TIMEOUT);
                pool.put(conn(&edge, Member::Alive("a")).await);
                run_queued_tasks().await;
                // Its `Weak` is the sweeper's; having run, the sweeper waits for a retirement.
                assert_eq!(Rc::weak_count(&pool.idle), 1, "the sweeper waits");
                if pool_outlives_its_shard {
                    std::mem::forget(pool);
                }
            })
        })
        .join()
        .unwrap();
        let (retired, returned) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            routes().0.retirement.retire();
            let _ = retired.send(());
        });
        // Bounds a failure only: a working retire() returns at once.
        returned
            .recv_timeout(Duration::from_secs(30))
            .expect("retire() returned");
    }
}
